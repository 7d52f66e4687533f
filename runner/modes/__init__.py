"""What a job does, one module a mode (`mode=`): train, plan, calibrate, report, example. Each
takes the validated config and works over the shared services: tracking, launch, the planner."""
