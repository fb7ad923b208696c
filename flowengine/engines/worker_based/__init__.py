"""The worker-based engine: tasks run on remote workers reached through kombu.

Subpackages (doc/source/architecture.rst has the map and a picture):

* ``wire`` -- what travels: names, headers, schemas, messages, the request
  state machine, failures, liveness and time-limit values, signing;
* ``transports`` -- flowengine's kombu transports and what they declare
  beyond kombu's contract, leases, topology, broker errors;
* ``messaging`` -- broker settings, publisher, consumer, dispatcher, and the
  one rule for acknowledging a message;
* ``executor_side`` -- the engine's side (executor, publisher, replies,
  housekeeping, discovery);
* ``worker_side`` -- the worker's side (worker, server, intake, performer,
  replier, shutdown);
* ``events`` -- the event stream.

TaskFlow's module paths (``engine``, ``executor``, ``worker``, ``server``,
``endpoint``, ``protocol``, ``proxy``, ``dispatcher``, ``types``) and
flowengine's ``context`` are thin modules importing from there. Importing
this package imports nothing heavy; import the module you need.
"""
