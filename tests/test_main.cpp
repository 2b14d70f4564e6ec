// main() of the CPU test programs: the Catch2 session, as Catch2's own main() runs it.
#include "test_main.hpp"

int main(int argc, char *argv[]) { return twtest::run_catch(argc, argv); }
