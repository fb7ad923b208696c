"""Conductors (TaskFlow's ``taskflow.conductors``): run the jobs of a jobboard."""
