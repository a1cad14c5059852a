"""Running federations: processes (procs, rayhead), one simulation (launch), one in-process
run (inprocess), deployments (deploy, sites) and bench matrices (bench; their format is
flower_pfl.matrix). The command line (flower_pfl.cli) sits on top of this layer."""
