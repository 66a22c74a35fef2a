// Compiles the umbrella header as C++ (the bindings' language); the build fails on any warning.
#include <mg/mg.h>

int main() { return mg_op_name(MG_OP_ADD) == nullptr ? 1 : 0; }
