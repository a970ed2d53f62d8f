"""Reports whether the database and the queue are reachable, for the load balancer."""


def liveness(*args):
    return args


def readiness(*args):
    return args
