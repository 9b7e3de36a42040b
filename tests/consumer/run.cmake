# Test install_consumer (cmake -P): installs the dyngrad build in BUILD_DIR into a scratch prefix under
# WORK_DIR, then configures, builds and runs the consumer project in SOURCE_DIR against that prefix
# with the compiler CXX_COMPILER and the generator GENERATOR, as a Release build. With WITH_CUDA on, the
# consumer also compiles a kernel of its own against the public dyngrad/cuda/user_kernels.h with
# CUDA_COMPILER for CUDA_ARCHITECTURES.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: pass -D${var}=...")
  endif()
endforeach()

set(cuda_args -DCONSUMER_CUDA=OFF)
if(WITH_CUDA)
  set(cuda_args -DCONSUMER_CUDA=ON -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})
endif()

# Internal headers stay in the source tree (CMakeLists.txt lists the public ones).
set(internal_headers cuda/context.h cuda/context_owner.h cuda/cudnn_plans.h cuda/handle.h cuda/plan_cache.h)

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

# Runs one step; stops the test with the step's output when it fails, prints it otherwise.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  message(STATUS "install_consumer: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(header ${internal_headers})
  file(GLOB_RECURSE found ${prefix}/*/dyngrad/${header})
  if(found)
    message(FATAL_ERROR "install_consumer: the internal header ${header} was installed: ${found}")
  endif()
endforeach()

# The library directory depends on GNUInstallDirs (lib, lib64, lib/<multiarch>): find it.
file(GLOB_RECURSE installed_libs LIST_DIRECTORIES false ${prefix}/libdyngrad.*)
if(NOT installed_libs)
  message(FATAL_ERROR "install_consumer: no libdyngrad under ${prefix}")
endif()
list(GET installed_libs 0 installed_lib)
get_filename_component(lib_dir ${installed_lib} DIRECTORY)

# No package registry: the package must come from the prefix just installed.
run_step("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_RPATH=${lib_dir} ${cuda_args})
file(STRINGS ${consumer_build}/CMakeCache.txt package_dir REGEX "^dyngrad_DIR:")
string(FIND "${package_dir}" "${prefix}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "install_consumer: the consumer found dyngrad outside ${prefix}: ${package_dir}")
endif()

run_step("build" ${CMAKE_COMMAND} --build ${consumer_build})
run_step("run" ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${lib_dir} ${consumer_build}/app)
message(STATUS "${step_output}")
