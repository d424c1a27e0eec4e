package dispatcher_test

const childEnv = "SIDEFX_DISPATCHER_CHILD"

func childMain() int { return 2 }
