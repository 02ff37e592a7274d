"""Tests of the run supervisor: launch, admission, recovery, resume, append, intercom."""
