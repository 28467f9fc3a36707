// Fault control for load_ops (tests/test_registry.cpp): a shared library whose entry point
// registers no op; loading it must be refused, not pass as if its ops were there.
extern "C" void tapegrad_register_ops() {}
