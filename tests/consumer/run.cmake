# Tests of dyngrad as another project's dependency (cmake -P), one per MODE:
#   install       install_consumer: installs the dyngrad build in BUILD_DIR into a scratch prefix, then
#                 configures, builds and runs the consumer project of this directory against it (find_package);
#   static        static_consumer: installs the static, CPU-only library that subdirectory_consumer built (its
#                 project in SUBDIRECTORY_WORK_DIR includes dyngrad's install rules, so `cmake --install` of it is
#                 the static package; one compile of the library serves both tests), then the same consumer
#                 against that prefix;
#   dist          dist_consumer: installs the dyngrad build in BUILD_DIR (built with its dist layer), then
#                 configures and builds dist/ (find_package(dyngrad COMPONENTS dist)) against it and runs it on
#                 two ranks with MPIRUN;
#   subdirectory  subdirectory_consumer: configures, builds and runs subdirectory/, a project that includes
#                 DYNGRAD_SOURCE with add_subdirectory().
# Everything under WORK_DIR (emptied first), as Release builds with the compiler CXX_COMPILER (through
# LAUNCHER, e.g. ccache, when the calling build has one), the generator GENERATOR and JOBS parallel jobs.
# Every installed package must hold no internal header; with WITH_CUDA on, install_consumer also compiles a
# kernel of its own against the public dyngrad/cuda/user_kernels.h with CUDA_COMPILER for CUDA_ARCHITECTURES.
foreach(var MODE WORK_DIR CXX_COMPILER GENERATOR JOBS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: pass -D${var}=...")
  endif()
endforeach()
set(test_name "${MODE}_consumer")
set(consumer_source ${CMAKE_CURRENT_LIST_DIR})
set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

set(compiler_args -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(LAUNCHER)
  list(APPEND compiler_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()

# Internal headers stay in the source tree (CMakeLists.txt lists the public ones).
set(internal_headers cuda/context.h cuda/context_owner.h cuda/cudnn_plans.h cuda/handle.h cuda/plan_cache.h
    graph/backend.h core/device_memory.h ops/kernels.h)

# Runs one step; stops the test with the step's output when it fails, prints it otherwise.
function(run_step what)
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${test_name}: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  message(STATUS "${test_name}: ${what}: ok (${seconds} s)")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# The consumer of this directory against the package installed under `prefix`, which must hold a library
# file matching `library_glob` and no internal header; further arguments go to the consumer's configure.
function(consume_installed_package library_glob)
  foreach(header ${internal_headers})
    file(GLOB_RECURSE found ${prefix}/*/dyngrad/${header})
    if(found)
      message(FATAL_ERROR "${test_name}: the internal header ${header} was installed: ${found}")
    endif()
  endforeach()
  # The library directory depends on GNUInstallDirs (lib, lib64, lib/<multiarch>): find it.
  file(GLOB_RECURSE installed_libs LIST_DIRECTORIES false ${prefix}/${library_glob})
  if(NOT installed_libs)
    message(FATAL_ERROR "${test_name}: no ${library_glob} under ${prefix}")
  endif()
  list(GET installed_libs 0 installed_lib)
  get_filename_component(lib_dir ${installed_lib} DIRECTORY)
  # No package registry: the package must come from the prefix just installed.
  run_step("configure the consumer" ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build} -G ${GENERATOR}
           ${compiler_args} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
           -DCMAKE_BUILD_RPATH=${lib_dir} ${ARGN})
  file(STRINGS ${consumer_build}/CMakeCache.txt package_dir REGEX "^dyngrad_DIR:")
  string(FIND "${package_dir}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "${test_name}: the consumer found dyngrad outside ${prefix}: ${package_dir}")
  endif()
  run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build} --parallel ${JOBS})
  run_step("run the consumer" ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${lib_dir} ${consumer_build}/app
           ${WORK_DIR}/labels.idx)
  message(STATUS "${step_output}")
endfunction()

if(MODE STREQUAL "install")
  if(NOT BUILD_DIR)
    message(FATAL_ERROR "run.cmake: MODE=install needs -DBUILD_DIR=<the dyngrad build>")
  endif()
  run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
  set(cuda_args -DCONSUMER_CUDA=OFF)
  if(WITH_CUDA)
    set(cuda_args -DCONSUMER_CUDA=ON -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}
                  -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})
  endif()
  consume_installed_package("libdyngrad.*" ${cuda_args})
elseif(MODE STREQUAL "dist")
  if(NOT BUILD_DIR OR NOT MPIRUN)
    message(FATAL_ERROR "run.cmake: MODE=dist needs -DBUILD_DIR=<the dyngrad build> and -DMPIRUN=<mpirun>")
  endif()
  run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
  foreach(header distributed/process_group.h distributed/ddp.h distributed/zero.h)
    file(GLOB_RECURSE found ${prefix}/*/dyngrad/${header})
    if(NOT found)
      message(FATAL_ERROR "${test_name}: the public header ${header} was not installed")
    endif()
  endforeach()
  foreach(header distributed/group_impl.h distributed/zero_impl.h distributed/rendezvous.h)
    file(GLOB_RECURSE found ${prefix}/*/dyngrad/${header})
    if(found)
      message(FATAL_ERROR "${test_name}: the internal header ${header} was installed: ${found}")
    endif()
  endforeach()
  file(GLOB_RECURSE installed_libs LIST_DIRECTORIES false ${prefix}/libdyngrad_dist.*)
  if(NOT installed_libs)
    message(FATAL_ERROR "${test_name}: no libdyngrad_dist under ${prefix}")
  endif()
  list(GET installed_libs 0 installed_lib)
  get_filename_component(lib_dir ${installed_lib} DIRECTORY)
  run_step("configure the consumer" ${CMAKE_COMMAND} -S ${consumer_source}/dist -B ${consumer_build} -G ${GENERATOR}
           ${compiler_args} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
           -DCMAKE_BUILD_RPATH=${lib_dir})
  run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build} --parallel ${JOBS})
  # OpenMPI refuses root without these (CI runs as root); NCCL is not used: the consumer's tensors are CPU ones.
  run_step("run the consumer on 2 ranks" ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${lib_dir} OMPI_ALLOW_RUN_AS_ROOT=1
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none DYNGRAD_DIST_TIMEOUT=60
           ${MPIRUN} -np 2 --oversubscribe ${consumer_build}/app)
  message(STATUS "${step_output}")
elseif(MODE STREQUAL "static")
  if(NOT SUBDIRECTORY_WORK_DIR OR NOT EXISTS ${SUBDIRECTORY_WORK_DIR}/build/CMakeCache.txt)
    message(FATAL_ERROR "run.cmake: MODE=static needs -DSUBDIRECTORY_WORK_DIR=<subdirectory_consumer's WORK_DIR>, "
                        "built by that test first (CTest fixture)")
  endif()
  run_step("install static dyngrad (subdirectory_consumer's build)" ${CMAKE_COMMAND}
           --install ${SUBDIRECTORY_WORK_DIR}/build --prefix ${prefix})
  file(GLOB_RECURSE shared_libs LIST_DIRECTORIES false ${prefix}/libdyngrad.so*)
  if(shared_libs)
    message(FATAL_ERROR "${test_name}: a static build installed ${shared_libs}")
  endif()
  consume_installed_package("libdyngrad.a")
elseif(MODE STREQUAL "subdirectory")
  if(NOT DYNGRAD_SOURCE)
    message(FATAL_ERROR "run.cmake: MODE=subdirectory needs -DDYNGRAD_SOURCE=<dyngrad's source tree>")
  endif()
  # No build type: the library compiles unoptimised, in about half the time of Release on CI's 2 cores (this test
  # checks that the source tree builds and links as a subproject, not how fast it runs), and a build type is the
  # including project's choice, which dyngrad leaves alone as a subproject.
  list(TRANSFORM compiler_args REPLACE "^-DCMAKE_BUILD_TYPE=Release$" "-DCMAKE_BUILD_TYPE=")
  run_step("configure" ${CMAKE_COMMAND} -S ${consumer_source}/subdirectory -B ${consumer_build} -G ${GENERATOR}
           ${compiler_args} -DDYNGRAD_SOURCE=${DYNGRAD_SOURCE} -DDYNGRAD_CUDA=OFF)
  run_step("build (dyngrad and the consumer)" ${CMAKE_COMMAND} --build ${consumer_build} --parallel ${JOBS})
  run_step("run" ${consumer_build}/app ${WORK_DIR}/labels.idx)
  message(STATUS "${step_output}")
else()
  message(FATAL_ERROR "run.cmake: MODE must be install, static or subdirectory, not '${MODE}'")
endif()
