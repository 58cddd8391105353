-- job_submit.lua written by `mig-batch slurm install` for a site that had none. Slurm runs this file;
-- a site rule goes above the two lines below, as function slurm_job_submit(job_desc, part_list,
-- submit_uid) and slurm_job_modify(job_desc, job_rec, part_list, modify_uid): they run first, then
-- mig_batch's (a job they refuse goes no further).

-- mig_batch's MIG jobs (docs/slurm.md, Install): keep this line after the site's own functions
dofile("/etc/slurm/mig-batch-submit.lua")

return slurm.SUCCESS
