/*
 * The Slurm calls mig_batch makes once per job or pass, over libslurm: one RPC each, no process.
 *   - mb_job_lines: a job's records as the line `squeue -h -O FIELDS` prints (mig_batch/slurm/commands.py),
 *     for the node agent's read of its decision; mb_all_job_lines: every job's, for mig-batchd's poll,
 *     only when one changed;
 *   - mb_update_job: a pin (nodes, AdminComment, time limit, TRES) and its release in one update, or the
 *     node's report.
 * Built by `mig-batch slurm install` against the site's own slurm.h and loaded with ctypes
 * (mig_batch/slurm/native.py); without it mig_batch runs Slurm's commands instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

/* exported by libslurm; slurm.h does not declare them. Later releases name job_reason_string
   slurm_job_state_reason_string (23.11, as upstream's src/common/job_state_reason.c reads; built against 22.05, 24.11 and 26.05) */
extern char *slurm_job_state_string(uint32_t inx);
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
extern const char *slurm_job_state_reason_string(enum job_state_reason inx);
#define job_reason_text(r) slurm_job_state_reason_string(r)
#else
extern char *slurm_job_reason_string(enum job_state_reason inx);
#define job_reason_text(r) slurm_job_reason_string(r)
#endif

/* the interface below; mig_batch/slurm/native.py refuses a library of another */
int mb_abi_version(void) { return 5; }
long mb_built_version(void) { return SLURM_VERSION_NUMBER; }
void mb_init(const char *conf) { slurm_init(conf && *conf ? conf : NULL); }
void mb_free(char *text) { free(text); }
const char *mb_strerror(int code) { return slurm_strerror(code); }

/* squeue's _print_time with SLURM_TIME_FORMAT=%s (slurm_make_time_str) */
static void put_time(FILE *f, time_t t)
{
	if (t == 0)
		fputs("N/A|", f);
	else if (t == (time_t) INFINITE)
		fputs("Unknown|", f);
	else if (t == (time_t) NO_VAL)
		fputs("None|", f);
	else
		fprintf(f, "%" PRId64 "|", (int64_t) t);
}

/* squeue's [days-][hh:]mm:ss (its _print_secs) */
static void put_minutes(FILE *f, uint32_t minutes)
{
	long secs = (long) minutes * 60;

	if (secs > 365L * 24 * 3600)
		fputs("INVALID|", f);
	else if (secs >= 86400)
		fprintf(f, "%ld-%2.2ld:%2.2ld:00|", secs / 86400, secs / 3600 % 24, secs / 60 % 60);
	else if (secs >= 3600)
		fprintf(f, "%ld:%2.2ld:00|", secs / 3600, secs / 60 % 60);
	else
		fprintf(f, "%ld:00|", secs / 60);
}

static void put_text(FILE *f, const char *text) { fprintf(f, "%s|", text ? text : "(null)"); }

/* One record as squeue prints it with SLURM_TIME_FORMAT=%s (src/squeue/print.c of 22.05). */
static void put_job(FILE *f, const slurm_job_info_t *job)
{
	fprintf(f, "%u|", job->job_id);  /* -O JobID: the record's own id, an array task's too */
	if (job->array_task_str || job->array_task_id != NO_VAL)  /* -O ArrayJobID,ArrayTaskID */
		fprintf(f, "%u|", job->array_job_id);
	else
		fprintf(f, "%u|", job->job_id);
	if (job->array_task_str)  /* the array's pending tasks, in one record */
		put_text(f, job->array_task_str);
	else if (job->array_task_id != NO_VAL)
		fprintf(f, "%u|", job->array_task_id);
	else
		fputs("N/A|", f);
	put_text(f, slurm_job_state_string(job->job_state));
	fprintf(f, "%u|%d|", job->priority, (int) job->user_id);
	put_text(f, job->nodes ? job->nodes : "");
	put_time(f, job->submit_time);
	put_time(f, job->start_time);
	if (job->time_limit == INFINITE && job->end_time > time(NULL))
		fputs("NONE|", f);
	else
		put_time(f, job->end_time);
	if (job->time_limit == INFINITE)
		fputs("UNLIMITED|", f);
	else if (job->time_limit == NO_VAL)
		fputs("NOT_SET|", f);
	else
		put_minutes(f, job->time_limit);
	fprintf(f, "%d|", (int) job->exit_code);
	/* -O Reason: free text, so its end is REASON_END of commands.py (ASCII's unit separator) */
	fprintf(f, "%s\x1f", job->state_desc ? job->state_desc : job_reason_text(job->state_reason));
	fprintf(f, "%u|", job->num_cpus);
	put_text(f, job->partition);
	put_time(f, job->eligible_time);  /* -O EligibleTime: the job's begin time (--begin) */
	put_text(f, job->dependency);
	/* -O admin_comment: free text, so the record ends with RECORD_END of commands.py (ASCII's record
	   separator) before the newline */
	fprintf(f, "%s\x1e\n", job->admin_comment ? job->admin_comment : "(null)");
}

static int put_jobs(job_info_msg_t *msg, char **out)
{
	size_t size = 0;
	FILE *f = open_memstream(out, &size);

	if (f == NULL) {
		slurm_free_job_info_msg(msg);
		return ENOMEM;
	}
	for (uint32_t i = 0; i < msg->record_count; i++)
		put_job(f, &msg->job_array[i]);
	slurm_free_job_info_msg(msg);
	return fclose(f) == 0 ? 0 : ENOMEM;
}

/* slurm_get_errno() is gone from 24.11's libslurm; errno itself carries Slurm's codes, on 22.05 too */
static int slurm_error(void) { return errno ? errno : SLURM_ERROR; }

/* Every record of job `job_id` (an array's tasks, too) into *out (free with mb_free): 0 or Slurm's error.
   The flags of `squeue --local -j ID`: SHOW_LOCAL skips the federation read. */
int mb_job_lines(uint32_t job_id, char **out)
{
	job_info_msg_t *msg = NULL;

	*out = NULL;
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(26, 5, 0)
	slurm_step_id_t id = SLURM_STEP_ID_INITIALIZER;  /* 26.05: a step id (job_id or sluid) */

	id.job_id = job_id;
	if (slurm_load_job(&msg, id, SHOW_ALL | SHOW_LOCAL) != SLURM_SUCCESS)
#else
	if (slurm_load_job(&msg, job_id, SHOW_ALL | SHOW_LOCAL) != SLURM_SUCCESS)
#endif
		return slurm_error();
	return put_jobs(msg, out);
}

/* Every job's records into *out, as `squeue --local -t all` lists them, when any changed since `since`
   (slurmctld's stamp of an earlier answer, in *stamp; 0: always): else SLURM_NO_CHANGE_IN_DATA. */
int mb_all_job_lines(int64_t since, int64_t *stamp, char **out)
{
	job_info_msg_t *msg = NULL;

	*out = NULL;
	if (slurm_load_jobs((time_t) since, &msg, SHOW_LOCAL) != SLURM_SUCCESS)
		return slurm_error();
	*stamp = (int64_t) msg->last_update;
	return put_jobs(msg, out);
}

/*
 * Update one job: NULL text and NO_VAL time_limit leave a field as it is; start_now sets its begin time to
 * now; release resets a held job's priority (scontrol release). slurmctld applies the nodes, AdminComment
 * and time limit before the release within the one RPC and stops at the first field it refuses, so a job
 * whose nodes it refuses is not released; the TRES and the begin time come after the release (give those
 * without release, then release with a second call), and so do its limit checks (QOS thresholds, partition
 * access): refused there, the job is released with the fields before applied. 0 or Slurm's error.
 */
int mb_update_job(const char *job_id, const char *nodes, const char *admin_comment, uint32_t time_limit,
		  int start_now, const char *tres_per_node, int release)
{
	job_desc_msg_t desc;
	job_array_resp_msg_t *resp = NULL;
	int rc;

	slurm_init_job_desc_msg(&desc);
	desc.job_id_str = (char *) job_id;
	desc.req_nodes = (char *) nodes;
	desc.admin_comment = (char *) admin_comment;
	desc.tres_per_node = (char *) tres_per_node;
	if (time_limit != NO_VAL)
		desc.time_limit = time_limit;
	if (start_now)
		desc.begin_time = time(NULL);
	if (release)
		desc.priority = INFINITE;
	if (slurm_update_job2(&desc, &resp) != SLURM_SUCCESS)
		return slurm_error();
	rc = 0;
	for (uint32_t i = 0; resp && i < resp->job_array_count; i++)
		if (resp->error_code[i] != SLURM_SUCCESS)
			rc = resp->error_code[i];
	if (resp)
		slurm_free_job_array_resp(resp);
	return rc;
}
