# Checks the built shared library (cmake -P; run by CTest): its soname is libtapegrad.so.<SOVERSION>,
# and its dynamic symbol table exports the entry points of autodiff/cpu.hpp, the ops' instances
# (autodiff/instances.hpp: matmul<double>, ...) and nothing outside namespace tapegrad: no
# per-level table getter (tapegrad_kernels_<level>), no weak copy of an inline function (fmt's, the
# standard library's, tapegrad's own), which a program would otherwise bind to by accident
# (cmake/libtapegrad.map keeps them local). And every exported object that has a guard variable
# (a function-local static or thread_local of header code: the tape's node pool, the products'
# scratch) exports its guard too: a program linked to the library shares the object with it, and an
# object shared under two guards is constructed twice, registered twice for destruction, and freed
# twice at exit (a double free in glibc's thread-local destructors).
# Arguments (-D): LIBRARY (the .so), SOVERSION, NM, READELF. Fault controls, each linking
# libtapegrad.a into a shared library of the same soname and checking that one instead, which must
# be rejected: UNFILTERED_FROM (the archive) links it without the version script; HIDDEN_GUARDS_FROM
# (the archive) with VERSION_SCRIPT less its guard-variable line.
cmake_minimum_required(VERSION 3.20)

include(${CMAKE_CURRENT_LIST_DIR}/../command_output.cmake)

if(UNFILTERED_FROM)
  set(LIBRARY ${WORK_DIR}/libtapegrad-unfiltered.so)
  file(MAKE_DIRECTORY ${WORK_DIR})
  output_of(ignored ${CXX_COMPILER} -shared -Wl,-soname,libtapegrad.so.${SOVERSION} -o ${LIBRARY}
            -Wl,--whole-archive ${UNFILTERED_FROM} -Wl,--no-whole-archive -lfmt -pthread)
elseif(HIDDEN_GUARDS_FROM)
  set(LIBRARY ${WORK_DIR}/libtapegrad-hidden-guards.so)
  file(MAKE_DIRECTORY ${WORK_DIR})
  file(READ ${VERSION_SCRIPT} script)
  string(REGEX REPLACE "\n *guard[^\n]*" "" script "${script}")
  file(WRITE ${WORK_DIR}/hidden-guards.map "${script}")
  output_of(ignored ${CXX_COMPILER} -shared -Wl,-soname,libtapegrad.so.${SOVERSION} -o ${LIBRARY}
            -Wl,--version-script=${WORK_DIR}/hidden-guards.map
            -Wl,--whole-archive ${HIDDEN_GUARDS_FROM} -Wl,--no-whole-archive -lfmt -pthread)
endif()

output_of(dynamic ${READELF} -d ${LIBRARY})
if(NOT dynamic MATCHES "\\(SONAME\\)[^\n]*\\[libtapegrad\\.so\\.${SOVERSION}\\]")
  message(FATAL_ERROR "${LIBRARY}: the soname should be libtapegrad.so.${SOVERSION}:\n${dynamic}")
endif()

# One line per defined dynamic symbol: "<address> <type> <demangled name>".
output_of(symbols ${NM} -D --defined-only -C ${LIBRARY})
string(REGEX REPLACE "\n$" "" symbols "${symbols}")
string(REPLACE ";" "\\;" symbols "${symbols}")
string(REPLACE "\n" ";" symbols "${symbols}")
set(outside "")
set(weak "")
foreach(line IN LISTS symbols)
  string(REGEX REPLACE "^[0-9a-f]* *([A-Za-z]) (.*)$" "\\1;\\2" fields "${line}")
  list(GET fields 0 type)
  list(GET fields 1 name)
  if(NOT name MATCHES "^(guard variable for )?tapegrad::")
    list(APPEND outside "${name}")
  elseif(type MATCHES "^[WVw]$" AND name MATCHES "\\)( const)?$" AND NOT name MATCHES ">\\("
         AND NOT name MATCHES "^tapegrad::([A-Za-z_0-9]+::)*[A-Za-z_0-9]+<")
    # A weak function (its name ends in its parameters) that is not a template instance: a copy of
    # an inline function. (Template instances are weak too: the ops' entry points the library
    # compiles for float, double and mp50, autodiff/instances.hpp, and the function templates they
    # call; their names end in "<arguments>(parameters)". Weak objects are not copies of
    # functions: the function-local statics with their guards, above, and the op kinds
    # op_kind_of<Op, T>, which GCC marks unique and Clang weak. The members of a class template
    # instance, such as the tapes the library compiles, Tape<double>::backward, are weak
    # template instances as well: "tapegrad::Tape<...>::name(...)".)
    list(APPEND weak "${name}")
  endif()
endforeach()
list(LENGTH outside outside_count)
list(LENGTH weak weak_count)
if(outside_count GREATER 0 OR weak_count GREATER 0)
  list(SUBLIST outside 0 10 outside_some)
  message(FATAL_ERROR "${LIBRARY} exports ${outside_count} symbols outside namespace tapegrad "
                      "(${outside_some} ...) and ${weak_count} weak copies of inline functions (${weak})")
endif()

# Every guard variable in the library's symbol table (nm without -D) whose object is exported must
# be exported itself.
set(exported_names "\n")
foreach(line IN LISTS symbols)
  string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] " "" name "${line}")
  string(APPEND exported_names "${name}\n")
endforeach()
output_of(all_symbols ${NM} --defined-only -C ${LIBRARY})
string(REGEX MATCHALL "[^\n]* guard variable for [^\n]*" guard_lines "${all_symbols}")
set(split "")
set(guarded 0)
foreach(line IN LISTS guard_lines)
  string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] guard variable for " "" object "${line}")
  string(FIND "${exported_names}" "\n${object}\n" object_at)
  if(NOT object_at EQUAL -1)
    math(EXPR guarded "${guarded} + 1")
    string(FIND "${exported_names}" "\nguard variable for ${object}\n" guard_at)
    if(guard_at EQUAL -1)
      list(APPEND split "${object}")
    endif()
  endif()
endforeach()
list(LENGTH split split_count)
if(split_count GREATER 0)
  list(GET split 0 first_split)
  message(FATAL_ERROR "${LIBRARY} exports ${split_count} guarded objects without their guard variables, so a "
                      "program and the library would each construct and destroy them (${first_split} ...)")
endif()

# The entry points of autodiff/cpu.hpp and ops/fast/kernels.hpp, each defined (T) in the library.
foreach(entry "tapegrad::cpu_level()" "tapegrad::cpu_level_available(tapegrad::CpuLevel)"
              "tapegrad::available_cpu_levels()" "tapegrad::set_cpu_level(tapegrad::CpuLevel)"
              "tapegrad::EngineKernels<double> const& tapegrad::engine_kernels<double>()"
              "tapegrad::EngineKernels<float> const& tapegrad::engine_kernels<float>()"
              "tapegrad::OpKernels<double> const& tapegrad::op_kernels<double>()"
              "tapegrad::OpKernels<float> const& tapegrad::op_kernels<float>()")
  string(FIND "${symbols}" " T ${entry}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${LIBRARY} does not export ${entry}")
  endif()
endforeach()
# Some of the ops' instances (weak, W), one per library scalar type.
foreach(entry "tapegrad::Var<double> tapegrad::matmul<double>(" "tapegrad::Var<float> tapegrad::softmax<float>("
              "tapegrad::fused_attention<boost::multiprecision::")
  string(FIND "${symbols}" "${entry}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${LIBRARY} does not export the op instance ${entry}")
  endif()
endforeach()
list(LENGTH symbols count)
message(STATUS "${LIBRARY}: soname libtapegrad.so.${SOVERSION}, ${count} symbols exported, all in namespace tapegrad; "
               "${guarded} guarded objects exported with their guards")
