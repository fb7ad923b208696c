"""Which TaskFlow unit-test modules are public API (gated) and which are not.

A module is *public* when everything it exercises is presented in TaskFlow's
documentation without the "internal, may change without notice" warning;
the gate covers only those.  *internal* modules exercise implementation
classes (the action engine's compiler/builder/scopes, worker-based component
classes, ``taskflow.utils``) or patch private names: they run and are
reported, never gated (and a few that would only time out are not run).
*deferred* modules need a part flowengine has not built yet (none now).
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
    "utils.test_kazoo_utils": (
        PUBLIC,
        "kazoo_utils.make_client: how the ZooKeeper backends'"
        " conf becomes a client (issue 13 names it API)",
    ),
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
    "test_conductors": (
        PUBLIC,
        "conductors.backends on a ZooKeeper board, documented in conductors",
    ),
    "jobs.test_entrypoint": (PUBLIC, "jobs.backends.fetch of the redis/zookeeper boards"),
    "jobs.test_etcd_job": (
        PUBLIC,
        "EtcdJobBoard through the JobBoard API on a real etcd, documented in jobs",
    ),
    "jobs.test_redis_job": (
        PUBLIC,
        "RedisJobBoard through the JobBoard API, and how its conf"
        " keys (host, ssl, sentinel...) become a redis-py client,"
        " documented in jobs",
    ),
    "jobs.test_zk_job": (PUBLIC, "ZookeeperJobBoard through the JobBoard API, documented in jobs"),
    "persistence.test_zk_persistence": (PUBLIC, "ZooKeeper backend, documented in persistence"),
}


# Tests of public modules that reach into private names (TaskFlow's leading
# underscore) or patch what TaskFlow happens to call inside: internal,
# whatever their module.  Keys are "module::method" (the method may be
# inherited by several test classes); values say what the test touches.
INTERNAL_TESTS: dict[str, str] = {
    "test_engine_helpers::test_no_arg_factory": "patches oslo_utils.importutils.import_class",
    "test_engine_helpers::test_factory_with_arg": "patches oslo_utils.importutils.import_class",
    "test_engine_helpers::test_it_works": "engine._flow, storage._flowdetail",
    "test_engine_helpers::test_it_works_by_name": "engine._flow, storage._flowdetail",
    "test_exceptions::test_no_looping": "exception._cause",
    "test_failure::test_copy_none": "failure._copy_exc_info",
    "test_failure::test_copy_exc_info": "failure._copy_exc_info",
    "test_failure::test_none_equals": "failure._are_equal_exc_info_tuples",
    "test_failure::test_none_ne_tuple": "failure._are_equal_exc_info_tuples",
    "test_failure::test_tuple_nen_none": "failure._are_equal_exc_info_tuples",
    "test_failure::test_tuple_equals_itself": "failure._are_equal_exc_info_tuples",
    "test_failure::test_typle_equals_copy": "failure._copy_exc_info",
    "test_formatters::test_exc_info_with_details_format": "patches FailureFormatter._format_node",
    "test_formatters::test_formatted_via_listener": "patches FailureFormatter._format_node",
    "test_formatters::test_mask_keys_edge_cases": "FailureFormatter._mask_keys",
    "test_listeners::test_record_ending_exception": "listener._engine",
    "test_listeners::test_event_time": "storage._flowdetail",
    "test_retries::test_restart_reverted_unordered_flows_with_retries": "engine._task_executor",
    "test_states::test_valid_flow_states": "states._ALLOWED_FLOW_TRANSITIONS",
    "test_states::test_ignored_flow_states": "states._IGNORED_FLOW_TRANSITIONS",
    "test_states::test_valid_job_states": "states._ALLOWED_JOB_TRANSITIONS",
    "test_states::test_ignored_job_states": "states._ALLOWED_JOB_TRANSITIONS",
    "test_states::test_valid_task_states": "states._ALLOWED_TASK_TRANSITIONS",
    "test_storage::test_save_and_get_non_cached_failure": "storage._failures",
    "test_storage::test_get_failure_after_reload": "storage._flowdetail",
    "test_storage::test_flow_metadata_update": "storage._flowdetail",
    "test_storage::test_inject_resumed": "storage._flowdetail",
    "test_storage::test_many_thread_ensure_same_task": "storage._flowdetail",
    "test_storage::test_many_thread_inject": "storage._flowdetail",
    "test_suspend::test_suspend_and_resume_linear_flow_on_revert": "storage._flowdetail",
    "test_suspend::test_suspend_and_revert_even_if_task_is_gone": "storage._flowdetail",
}


# Modules whose tests need a server (tools/conformance/run.py starts them from
# tests/brokers.py); where one cannot be had outside CI they leave the gate.
NEEDS: dict[str, tuple[str, ...]] = {
    "redis": ("jobs.test_redis_job",),
    "etcd": ("jobs.test_etcd_job",),
    "zookeeper": ("jobs.test_zk_job", "persistence.test_zk_persistence", "test_conductors"),
}

_ZK_LAYOUT = "TaskFlow's znode layout under its default path (jobNNN.lock siblings)"
_ZK_WAITS = _ZK_LAYOUT + "; on flowengine it would only wait out WAIT_TIMEOUT, so it is not run"
# Tests of the jobboard/ZooKeeper modules that check TaskFlow's storage layout
# or private names, or patch what TaskFlow calls inside: internal.
INTERNAL_TESTS.update(
    {
        "jobs.test_zk_job::test_posting_owner_lost": "rewrites the lock znode: " + _ZK_LAYOUT,
        "jobs.test_zk_job::test_posting_state_lock_lost": "deletes the lock znode: " + _ZK_LAYOUT,
        "jobs.test_zk_job::test_trashing_claimed_job": "counts the children of the board's path",
        "jobs.test_zk_job::test_posting_received_raw": "reads the job znode's raw data",
        "jobs.test_zk_job::test_posting_dates": "patches impl_zookeeper.misc.millis_to_datetime",
        "jobs.test_zk_job::test_register_entity": "reads the entity znode; expects"
        " NotImplementedError for a non-conductor"
        " (flowengine registers any kind)",
        "test_listeners::test_bad_create": _ZK_WAITS,
        "test_listeners::test_claim_lost_custom_handler": _ZK_WAITS,
        "test_listeners::test_claim_lost_new_owner": _ZK_WAITS,
        "test_listeners::test_claim_lost_suspended": _ZK_WAITS,
    }
)
# TaskFlow's etcd tests that replace the board's private ``_client`` with a
# mock and check which etcd3gw calls TaskFlow's own board makes (its
# ``jobNNN.data`` / ``jobNNN.lock`` keys under ``/taskflow/jobs``), or patch
# its helpers: internal (flowengine's board is one transaction per change).
_ETCD_MOCKED = (
    "replaces the board's _client with a mock and checks TaskFlow's etcd3gw calls and keys"
)
INTERNAL_TESTS.update(
    {
        "jobs.test_etcd_job::test_create_board": "reads the private _root_path (TaskFlow's"
        " /taskflow/jobs root)",
        "jobs.test_etcd_job::test_post": _ETCD_MOCKED + "; patches EtcdJobBoard.incr",
        "jobs.test_etcd_job::test_claim": _ETCD_MOCKED + "; patches set_last_modified",
        "jobs.test_etcd_job::test_claim_already_claimed": _ETCD_MOCKED + "; patches find_owner",
        "jobs.test_etcd_job::test_claim_deleted": _ETCD_MOCKED,
        "jobs.test_etcd_job::test_consume": _ETCD_MOCKED + "; patches get_owner_and_data",
        "jobs.test_etcd_job::test_consume_bad_owner": _ETCD_MOCKED,
        "jobs.test_etcd_job::test_abandon": _ETCD_MOCKED,
        "jobs.test_etcd_job::test_abandon_bad_owner": _ETCD_MOCKED,
        "jobs.test_etcd_job::test_trash": _ETCD_MOCKED + " (/taskflow/.trash)",
        "jobs.test_etcd_job::test_trash_bad_owner": _ETCD_MOCKED,
        "jobs.test_etcd_job::test_trash_deleted_job": _ETCD_MOCKED,
        "jobs.test_etcd_job::test__incr": "TaskFlow's key helper incr() and the private _client",
        "jobs.test_etcd_job::test_get_one": "TaskFlow's key helper get_one() and the private"
        " _client",
    }
)
#: Internal tests not even run on flowengine (they would only time out).
NOT_RUN = frozenset(test for test, why in INTERNAL_TESTS.items() if why is _ZK_WAITS)


def kind_of(module: str) -> str:
    """The gate kind of *module*; an unlisted module is internal until classified."""
    return MODULES.get(module, (INTERNAL, ""))[0]


def kind_of_test(module: str, test: str) -> str:
    """The gate kind of one test id (``path.py::Class::method``) of *module*."""
    method = test.rsplit("::", 1)[-1]
    if f"{module}::{method}" in INTERNAL_TESTS:
        return INTERNAL
    return kind_of(module)
