"""The HTCondor side of the batch-system seam: the adapter over the ``htcondor2`` bindings
(``adapter``), the job and machine attributes it uses (``attrs``) and a local pool for tests
(``pool``). The bindings are an optional extra (``pip install mig-batch[htcondor]``); nothing
outside this package imports them.
"""
