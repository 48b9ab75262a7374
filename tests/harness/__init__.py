"""The test harness, apart from the tests: what starts the engines, registries and stand-ins CI needs
(services), runs CI's jobs (ci), and the fakes, fault injection, stand-ins and upstream files the tests use."""
