"""Audits: callbacks that observe a run from outside and report what an adversary learns.

An audit may drive the algorithm (local training, rebuilding uploads) but never changes the run it
observes. `mia.MembershipInferenceAudit` is the `privacy=mia` group; `callback.AuditCallback` is
the adapter that runs an audit among the run's callbacks.
"""
