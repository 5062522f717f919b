// A dependency of the missing_dependency broken plugin; it exists at build time only.
extern "C" int qrecipe_test_missing_dep_value() { return 42; }
