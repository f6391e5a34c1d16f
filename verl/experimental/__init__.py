"""Features whose design is still moving in verl (same package path as verl): the agent loop."""
