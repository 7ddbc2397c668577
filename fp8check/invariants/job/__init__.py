"""Job rules: rules over an RL job's own configuration (the keys as the user wrote them, read by harness.jobconfig
into a Job), which `fp8check preflight` runs beside the C/X/A rules over the SyncConfig the job resolves to.

Ids (published ones never change meaning; new rules take the next free number of their prefix):
  K*  rules over the job's keys any stack can get wrong (K1-K9 are the first published pre-flight rules), and the
      checks SkyRL runs itself (SkyRL's are K2, K4, K7, K8, K10-K19);
  M*  the model: dims known, attention kinds;
  X6  the engine's ignored_layers override (exclusion family; it reads the job);
  V*  the checks verl runs, or documents and does not run;
  N*  the checks NeMo RL runs (its asserts, ValueErrors and KeyErrors);
  E*  mistakes the stacks let through, from their trackers, code reviews and source.
Every rule states its condition in one line, the stack file or tracker thread it mirrors (`source`; a rule of
fp8check's own says so), why it exists and what to change (`why`), and a severity (error | warning). Each
finding carries evidence `key` (the key or variable as the user writes it), `value` and `fix`. Rules read the job
only through `Job.value` / `Job.fact`, so `fp8check preflight --explain RULE` can print the provenance of every
value a rule read.
"""
from . import general, skyrl, verl, nemo, mistakes  # noqa: F401, I001  (registration, in catalog order)
