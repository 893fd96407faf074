# ctest driver: install the built attn into a scratch prefix, extract the C++ example from README.md,
# build it against the installed package and against the build tree with find_package(attn), run it.
# Inputs: -DBUILD_DIR -DSOURCE_DIR -DWORK_DIR [-DEXTRA_FLAGS]
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()

# The example is the first ```cpp block after the marker line in the README (its one C++ example; the pages of
# docs/ link to it).
file(READ "${SOURCE_DIR}/README.md" readme)
string(FIND "${readme}" "<!-- example: C++, compiled and run by tests/package -->" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no C++ example marker (<!-- example: C++, compiled and run by tests/package -->)")
endif()
string(SUBSTRING "${readme}" ${at} -1 rest)
string(FIND "${rest}" "```cpp\n" open)
string(SUBSTRING "${rest}" ${open} -1 rest)
string(LENGTH "```cpp\n" skip)
string(SUBSTRING "${rest}" ${skip} -1 rest)
string(FIND "${rest}" "```" close)
string(SUBSTRING "${rest}" 0 ${close} code)
file(WRITE "${WORK_DIR}/readme_example.cc" "${code}")

# The consumer twice: against the installed prefix (a user's way), and against the build tree itself
# (-Dattn_DIR=<build dir>, its exported targets).
foreach(kind IN ITEMS installed build-tree)
  if(kind STREQUAL "installed")
    set(where "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
  else()
    set(where "-Dattn_DIR=${BUILD_DIR}")
  endif()
  set(dir "${WORK_DIR}/build-${kind}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/package" -B "${dir}" "${where}"
                          "-DEXAMPLE_SOURCE=${WORK_DIR}/readme_example.cc" "-DEXPECT_DIST=${EXPECT_DIST}"
                          "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer (${kind}) failed:\n${log}")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the README example (${kind}) failed:\n${log}")
  endif()
  execute_process(COMMAND "${dir}/readme_example" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${kind}: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the README example (${kind}) exited with ${rc}")
  endif()
endforeach()
