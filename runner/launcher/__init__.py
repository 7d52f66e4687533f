"""The process launcher: who started this process and as which rank, starting a job's ranks
(a fork server they start from, a lifeline that ends them with their launcher), the settings each
rank's process takes (threads, allocator, garbage collector), and preemption. Light to import:
nothing heavy here."""
