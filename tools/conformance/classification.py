"""Which TaskFlow unit-test modules are public API (gated) and which are not.

A module is *public* when everything it exercises is presented in TaskFlow's
documentation without the "internal, may change without notice" warning;
the gate covers only those.  *internal* modules exercise implementation
classes (the action engine's compiler/builder/scopes, worker-based component
classes, ``taskflow.utils``) or patch private names: they run and are
reported, never gated.  *deferred* modules need the jobboard/conductor
machinery and join the gate with the jobboard issue.
"""

from __future__ import annotations

PUBLIC = "public"
INTERNAL = "internal"
DEFERRED = "deferred"

# Keys are module paths under taskflow/tests/unit, dotted; values (kind, reason).
MODULES: dict[str, tuple[str, str]] = {
    "test_arguments_passing": (PUBLIC, "requires/provides/rebind/inject through engines.load"),
    "test_check_transition": (PUBLIC, "states.check_*_transition, documented in states"),
    "test_deciders": (PUBLIC, "deciders (Depth and link deciders), documented in patterns"),
    "test_engine_helpers": (PUBLIC, "engines.load/run/flow_from_detail/load_from_factory"),
    "test_engines": (PUBLIC, "engines' public behaviour: run, revert, states, storage results"),
    "test_exceptions": (PUBLIC, "exceptions module, documented in exceptions"),
    "test_failure": (PUBLIC, "types.failure.Failure, documented in types"),
    "test_flow_dependencies": (PUBLIC, "flow requires/provides of the patterns"),
    "test_formatters": (PUBLIC, "formatters.FailureFormatter, documented in types/notifications"),
    "test_functor_task": (PUBLIC, "task.FunctorTask, documented in atoms"),
    "test_mapfunctor_task": (PUBLIC, "task.MapFunctorTask, documented in atoms"),
    "test_reducefunctor_task": (PUBLIC, "task.ReduceFunctorTask, documented in atoms"),
    "test_listeners": (PUBLIC, "listeners, documented in notifications"),
    "test_notifier": (PUBLIC, "types.notifier.Notifier, documented in notifications"),
    "test_progress": (PUBLIC, "task progress events, documented in notifications"),
    "test_retries": (PUBLIC, "retry controllers through engines, documented in atoms"),
    "test_states": (PUBLIC, "engine state machine as seen through states and notifications"),
    "test_storage": (PUBLIC, "storage.Storage, documented in persistence"),
    "test_suspend": (PUBLIC, "engine.suspend() and resumption, documented in engines"),
    "test_task": (PUBLIC, "task.Task/atom API: requires, provides, rebind, notifier"),
    "test_types": (PUBLIC, "types.graph/tree/timing/sets, documented in types"),
    "patterns.test_graph_flow": (PUBLIC, "patterns.graph_flow, documented in patterns"),
    "patterns.test_linear_flow": (PUBLIC, "patterns.linear_flow, documented in patterns"),
    "patterns.test_unordered_flow": (PUBLIC, "patterns.unordered_flow, documented in patterns"),
    "persistence.test_memory_persistence": (PUBLIC, "memory backend, documented in persistence"),
    "persistence.test_dir_persistence": (PUBLIC, "dir backend, documented in persistence"),
    "persistence.test_sql_persistence": (PUBLIC, "SQL backend, documented in persistence"),
    "test_utils": (INTERNAL, "taskflow.utils.misc/threading_utils helpers"),
    "test_utils_binary": (INTERNAL, "taskflow.utils.misc binary encode/decode"),
    "utils.test_iter_utils": (INTERNAL, "taskflow.utils.iter_utils"),
    "utils.test_threading_utils": (INTERNAL, "taskflow.utils.threading_utils"),
    "utils.test_kazoo_utils": (INTERNAL, "taskflow.utils.kazoo_utils (ZooKeeper client glue)"),
    "utils.test_redis_utils": (INTERNAL, "taskflow.utils.redis_utils (Redis client glue)"),
    "action_engine.test_builder": (INTERNAL, "action-engine machine builder"),
    "action_engine.test_compile": (INTERNAL, "action-engine compiler"),
    "action_engine.test_scoping": (INTERNAL, "action-engine scope walker"),
    "action_engine.test_creation": (INTERNAL, "inspects the engine's private executor attribute"),
    "worker_based.test_creation": (INTERNAL, "inspects worker-based engine's private executor"),
    "worker_based.test_dispatcher": (INTERNAL, "worker-based dispatcher class"),
    "worker_based.test_endpoint": (INTERNAL, "worker-based endpoint class"),
    "worker_based.test_executor": (INTERNAL, "worker-based executor class, mocked proxy"),
    "worker_based.test_message_pump": (INTERNAL, "worker-based proxy/dispatcher message pump"),
    "worker_based.test_pipeline": (INTERNAL, "worker-based executor and server wired by hand"),
    "worker_based.test_protocol": (INTERNAL, "worker-based protocol message classes"),
    "worker_based.test_proxy": (INTERNAL, "worker-based proxy class, mocked kombu"),
    "worker_based.test_server": (INTERNAL, "worker-based server class, mocked proxy"),
    "worker_based.test_types": (INTERNAL, "worker-based topic/finder types"),
    "worker_based.test_worker": (INTERNAL, "worker-based worker class, mocked server"),
    "test_conductors": (DEFERRED, "conductors need jobboards (jobboard issue)"),
    "jobs.test_entrypoint": (DEFERRED, "jobboard backends (jobboard issue)"),
    "jobs.test_etcd_job": (DEFERRED, "etcd jobboard (jobboard issue)"),
    "jobs.test_redis_job": (DEFERRED, "Redis jobboard (jobboard issue)"),
    "jobs.test_zk_job": (DEFERRED, "ZooKeeper jobboard (jobboard issue)"),
    "persistence.test_zk_persistence": (DEFERRED, "ZooKeeper persistence (jobboard issue)"),
}


def kind_of(module: str) -> str:
    """The gate kind of *module*; an unlisted module is internal until classified."""
    return MODULES.get(module, (INTERNAL, ""))[0]
