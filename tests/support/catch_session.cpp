// The Catch2 runner, compiled once for all test executables. With Catch2 2.x this translation unit
// also holds the whole framework implementation (CATCH_CONFIG_RUNNER); 3.x ships it as a library.
#if DYNGRAD_CATCH2_V3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <iostream>

#include "catch.h"
#include "dyngrad/dyngrad.h"

namespace dgtest {
int run_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

int run_gpu_session(int argc, char* argv[], const char* what) {
    if (dyngrad::cuda_device_count() == 0) {
        std::cout << "dyngrad: no CUDA device: " << what << " skipped" << std::endl;
        return 77;
    }
    return run_session(argc, argv);
}
}  // namespace dgtest
