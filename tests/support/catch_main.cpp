// The main of the test executables that need nothing before Catch starts (test_gpu has its own).
#include "catch.h"

int main(int argc, char* argv[]) { return dgtest::run_session(argc, argv); }
