# Type stubs for the parts of py-amqp flowengine uses (py-amqp ships no types).
