# Writes the part of a header (ops/elementwise_math.h, ops/dropout_mask.h) between its "// fusion-source-begin" and
# "// fusion-source-end" lines as one C++ raw string literal, for the fusion compiler's generated kernels
# (ops/fusion_source.cpp): NVRTC then compiles the same formulas as the op kernels without reading any file at run time.
# Usage: cmake -DINPUT=ops/elementwise_math.h -DOUTPUT=<build>/generated/elementwise_math_source.inc -P embed_source.cmake
file(READ "${INPUT}" text)
string(FIND "${text}" "// fusion-source-begin" begin)
string(FIND "${text}" "// fusion-source-end" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "${INPUT}: no '// fusion-source-begin' ... '// fusion-source-end' region to embed")
endif()
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${text}" ${begin} ${length} region)
string(FIND "${region}" ")dgsrc\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT}: the embedded region contains the raw-string delimiter )dgsrc\"")
endif()
set(content "R\"dgsrc(${region})dgsrc\"\n")
# Rewritten only when it changes, so an unrelated edit of the header rebuilds nothing.
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" previous)
  if(previous STREQUAL content)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${content}")
