"""Jobs and jobboards (TaskFlow's ``taskflow.jobs``): see :mod:`flowengine.jobs.base`."""
