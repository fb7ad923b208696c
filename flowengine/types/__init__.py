"""Value types shared across flowengine (failures, notifiers, ...)."""
