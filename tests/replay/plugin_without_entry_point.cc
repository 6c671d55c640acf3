// A loadable shared library that is not a capsule plugin: it exports a function, but not
// capsule_register_models. LoadPlugin must refuse it with kNotFound.
extern "C" __attribute__((visibility("default"))) int capsule_not_a_plugin() { return 42; }
