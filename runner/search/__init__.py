"""mode=search: every layout of a job priced by the planner in one process, the best that fit
first (runner/modes/search.py prints and records it).

space.py enumerates the layouts and runs the layout rules on each (a refused one is counted with
its reason); price.py prices each one that passes, sharing the work layouts have in common;
choose.py ranks them, marks the Pareto front of step time against memory and says why the best
beats the runner-up. Torch-free: a search of GPT-3's layouts starts within the interpreter's
start-up.
"""
