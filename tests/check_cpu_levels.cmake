# Proves on the built binaries that each CPU level runs its own code (cmake -P; run by CTest):
#  1. each level's object (CMakeLists.txt: ld -r, then objcopy) defines exactly one global symbol,
#     its table getter tapegrad_kernels_<level>, has no section group left and no weak or
#     GNU-unique symbol: nothing in it can be merged with another level's copy at link time, and
#     nothing outside can replace its code (its only undefined symbols are libc/libstdc++/libm, and
#     avx512_bf16's call of tapegrad_kernels_avx512, whose table it copies);
#  2. the levels' code really differs: the baseline object uses no ymm/zmm register, avx2 uses
#     ymm and no zmm, avx512 and avx512_bf16 use zmm; only avx512_bf16 has vdpbf16ps (the others
#     emulate it);
#  3. in a linked test program, our GEMM kernel exists once per level that compiles it (all but
#     avx512_bf16, which runs avx512's), and the bfloat16 product once per level, each copy local.
# Arguments (-D): BINARY_DIR (where tapegrad_cpu_<level>.o are), LEVELS (;-list), NM, OBJDUMP,
# READELF, EXECUTABLE (a test program linked with tapegrad); OBJECT_SUFFIX (default .o): the
# fault control passes .o.partial, the objects before objcopy, which the check must reject.
cmake_minimum_required(VERSION 3.20)

include(${CMAKE_CURRENT_LIST_DIR}/command_output.cmake)

function(count_matches variable regex text)
  string(REGEX MATCHALL "${regex}" matches "${text}")
  list(LENGTH matches count)
  set(${variable} ${count} PARENT_SCOPE)
endfunction()

if(NOT DEFINED OBJECT_SUFFIX)
  set(OBJECT_SUFFIX .o)
endif()
list(LENGTH LEVELS level_count)
foreach(level IN LISTS LEVELS)
  set(object ${BINARY_DIR}/tapegrad_cpu_${level}${OBJECT_SUFFIX})
  output_of(symbols ${NM} --defined-only ${object})
  string(REGEX MATCHALL "[0-9a-f]+ [A-Zu] [^\n]+" globals "${symbols}")
  if(NOT globals MATCHES "^[0-9a-f]+ T tapegrad_kernels_${level}$")
    message(FATAL_ERROR "${level}: the only global symbol should be tapegrad_kernels_${level}; found: ${globals}")
  endif()
  output_of(sections ${READELF} -S -W ${object})
  if(sections MATCHES "GROUP")
    message(FATAL_ERROR "${level}: a section group survived the partial link")
  endif()
  output_of(code ${OBJDUMP} -d --no-show-raw-insn ${object})
  count_matches(ymm "%ymm" "${code}")
  count_matches(zmm "%zmm" "${code}")
  count_matches(dpbf16 "vdpbf16ps" "${code}")
  message(STATUS "${level}: one global symbol; ${ymm} instructions on ymm, ${zmm} on zmm registers, ${dpbf16} vdpbf16ps")
  if(level STREQUAL "avx512_bf16" AND (zmm EQUAL 0 OR dpbf16 EQUAL 0))
    message(FATAL_ERROR "avx512_bf16: expected zmm registers and vdpbf16ps")
  elseif(NOT level STREQUAL "avx512_bf16" AND dpbf16 GREATER 0)
    message(FATAL_ERROR "${level}: vdpbf16ps belongs to the avx512_bf16 level only")
  endif()
  if(level STREQUAL "baseline" AND (ymm GREATER 0 OR zmm GREATER 0))
    message(FATAL_ERROR "baseline: the code uses AVX registers")
  elseif(level STREQUAL "avx2" AND (ymm EQUAL 0 OR zmm GREATER 0))
    message(FATAL_ERROR "avx2: expected ymm and no zmm registers")
  elseif(level STREQUAL "avx512" AND zmm EQUAL 0)
    message(FATAL_ERROR "avx512: expected zmm registers")
  endif()
endforeach()

output_of(linked ${NM} -C ${EXECUTABLE})
# (GCC may split a cold part off a function, "[clone .cold]": not a copy of its own.)
set(eigen_levels ${LEVELS})
list(REMOVE_ITEM eigen_levels avx512_bf16)
list(LENGTH eigen_levels eigen_level_count)
count_matches(copies "[0-9a-f]+ t [^\n]*cpu_detail::\\(anonymous namespace\\)::gemm_block<double>\\([^\n]*kernels::Block\\)\n" "${linked}")
count_matches(global_copies "[0-9a-f]+ [TW] [^\n]*cpu_detail::[^\n]*gemm_block<double>" "${linked}")
message(STATUS "${EXECUTABLE}: ${copies} local copies of the double GEMM kernel, ${global_copies} global")
if(NOT copies EQUAL eigen_level_count OR NOT global_copies EQUAL 0)
  message(FATAL_ERROR "expected ${eigen_level_count} local copies of gemm_block<double> (one per level but avx512_bf16), none global")
endif()
count_matches(bf16_copies "[0-9a-f]+ t [^\n]*cpu_detail::\\(anonymous namespace\\)::gemm_bf16_block<[^\n]*Bf16Tile>\\([^\n]*kernels::Block\\)\n" "${linked}")
count_matches(bf16_global_copies "[0-9a-f]+ [TW] [^\n]*cpu_detail::[^\n]*gemm_bf16_block<" "${linked}")
message(STATUS "${EXECUTABLE}: ${bf16_copies} local copies of the bfloat16 product, ${bf16_global_copies} global")
if(NOT bf16_copies EQUAL level_count OR NOT bf16_global_copies EQUAL 0)
  message(FATAL_ERROR "expected ${level_count} local copies of gemm_bf16_block (one per level), none global")
endif()
