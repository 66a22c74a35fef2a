/* Compiles the umbrella header as strict C11; the build fails on any warning. */
#include <mg/mg.h>

int main(void) { return mg_op_name(MG_OP_ADD) == 0; }
