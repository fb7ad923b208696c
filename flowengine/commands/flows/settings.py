"""Tunables and state groups of the ``flows`` commands (cheap to import: parsers use them)."""

from __future__ import annotations

from flowengine import states as st

#: Characters of a result shown by `flows show` without --full: enough for a
#: number, a short string or a small dict on one table line.
RESULT_SUMMARY_CHARS = 60

#: Flow states, in the order `--state` lists them.
FLOW_STATES = (
    st.PENDING,
    st.RUNNING,
    st.SUSPENDING,
    st.SUSPENDED,
    st.RESUMING,
    st.SUCCESS,
    st.FAILURE,
    st.REVERTED,
)

#: States of a flow whose engine may be running it right now.
IN_PROGRESS_STATES = (st.RUNNING, st.SUSPENDING, st.RESUMING)
