# The test of tapegrad-op-docs (tools/op_docs.cpp) itself, beyond op_docs_are_current: on a scratch
# copy of docs/ (ops/ linked from the source tree), --check passes on the committed files; a changed
# line of an op's section, a row of its summary table, a table row gone from docs/tape-file.md and
# its markers gone are each
# refused with exit 1, naming the file, the line, the op and the command that regenerates it; --write
# puts back exactly the committed files; and a bad command line exits 2.
#   cmake -DPROGRAM=... -DSOURCE=<source dir> -DWORK=<scratch dir> -P op_docs_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/docs)
file(CREATE_LINK ${SOURCE}/ops ${WORK}/ops SYMBOLIC)
foreach(doc ops.md tape-file.md)
  configure_file(${SOURCE}/docs/${doc} ${WORK}/docs/${doc} COPYONLY)
endforeach()
file(READ ${SOURCE}/docs/ops.md committed_reference)
file(READ ${SOURCE}/docs/tape-file.md committed_tape_file)

# run(EXPECTED_EXIT OUT ARGS...): the program on the scratch tree; its stderr and stdout into OUT.
function(run expected out)
  execute_process(COMMAND ${PROGRAM} ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT status EQUAL expected)
    message(FATAL_ERROR "tapegrad-op-docs ${ARGN}: exit ${status}, expected ${expected}\n${stdout}${stderr}")
  endif()
  set(${out} "${stdout}${stderr}" PARENT_SCOPE)
endfunction()

function(expect text pattern)
  if(NOT text MATCHES "${pattern}")
    message(FATAL_ERROR "expected /${pattern}/ in:\n${text}")
  endif()
endfunction()

# The line of `text` (1-based) that holds `needle`, into OUT.
function(line_of text needle out)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "'${needle}' not in the committed file")
  endif()
  string(SUBSTRING "${text}" 0 ${at} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines n)
  math(EXPR line "${n} + 1")
  set(${out} ${line} PARENT_SCOPE)
endfunction()

run(0 out ${WORK} --check)
expect("${out}" "hold the [0-9]+ ops' declarations")

# damaged_is_named(DOC NEEDLE REPLACEMENT OP OUT): docs/DOC with its first NEEDLE replaced is refused
# by --check naming DOC, NEEDLE's line and OP; the output into OUT; DOC restored afterwards.
function(damaged_is_named doc needle replacement op out)
  file(READ ${SOURCE}/docs/${doc} committed)
  line_of("${committed}" "${needle}" line)
  string(REPLACE "${needle}" "${replacement}" damaged "${committed}")
  file(WRITE ${WORK}/docs/${doc} "${damaged}")
  run(1 text ${WORK} --check)
  expect("${text}" "docs/${doc} is not what the ops declare: line ${line} \\(op ${op}\\)")
  configure_file(${SOURCE}/docs/${doc} ${WORK}/docs/${doc} COPYONLY)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# An op's section changed: its VJP line (the first line of exp's comment that states it).
damaged_is_named(ops.md "VJP: dA = G ∘ Y, since d e^a/da = e^a: the saved output is the derivative."
                 "VJP: dA = G, since d e^a/da = 1." exp out)
expect("${out}" "\\(op exp\\) is\n  VJP: dA = G, since")
expect("${out}" "and the declarations give\n  VJP: dA = G ∘ Y")
expect("${out}" "regenerate it with: cmake --build build --target op_docs")
# A row of the reference's summary table changed, the first one included: named by its op.
damaged_is_named(ops.md "| [`abs`](#abs) | `ops/abs.hpp` | 1 | none |"
                 "| [`abs`](#abs) | `ops/abs.hpp` | 2 | none |" abs out)
damaged_is_named(ops.md "| [`log1p`](#log1p) | `ops/log1p.hpp` | 1 | none |"
                 "| [`log1p`](#log1p) | `ops/log1p.hpp` | 2 | none |" log1p out)
# A row of the tape-file table gone, the first and the last included (the op after it is named).
foreach(row_op abs relu transpose)
  damaged_is_named(tape-file.md "| `${row_op}` | 1 | none |\n" "" ${row_op} out)
endforeach()
# tape-file.md's prose around the generated table is the hand-written format: --check compares the
# table alone, so a changed line before it and after it is accepted.
string(REPLACE "Real-valued\nsettings are" "Real-valued settings,\nwritten," prose "${committed_tape_file}")
string(APPEND prose "\nA line added after the generated table.\n")
if(prose STREQUAL committed_tape_file)
  message(FATAL_ERROR "the prose edit of tape-file.md changed nothing: its text moved")
endif()
file(WRITE ${WORK}/docs/tape-file.md "${prose}")
run(0 out ${WORK} --check)
configure_file(${SOURCE}/docs/tape-file.md ${WORK}/docs/tape-file.md COPYONLY)

# --write puts back exactly the committed files (from damaged copies of both).
string(REPLACE "| `relu` | 1 | none |\n" "" damaged "${committed_tape_file}")
file(WRITE ${WORK}/docs/tape-file.md "${damaged}")
string(REPLACE "## exp\n" "## e\n" damaged "${committed_reference}")
file(WRITE ${WORK}/docs/ops.md "${damaged}")
run(0 out ${WORK} --write)
file(READ ${WORK}/docs/ops.md written_reference)
file(READ ${WORK}/docs/tape-file.md written_tape_file)
if(NOT written_reference STREQUAL committed_reference OR NOT written_tape_file STREQUAL committed_tape_file)
  message(FATAL_ERROR "--write did not give back the committed docs/ops.md and docs/tape-file.md")
endif()
if(EXISTS ${WORK}/docs/ops.md.new OR EXISTS ${WORK}/docs/tape-file.md.new)
  message(FATAL_ERROR "--write left a temporary file behind")
endif()

# The markers gone: refused by name, in both modes, and nothing written.
string(REPLACE "<!-- end of the generated op table -->" "" damaged "${committed_tape_file}")
file(WRITE ${WORK}/docs/tape-file.md "${damaged}")
run(1 out ${WORK} --check)
expect("${out}" "docs/tape-file.md lacks the markers")
run(1 out ${WORK} --write)
expect("${out}" "lacks the markers")

run(2 out ${WORK})
expect("${out}" "usage: tapegrad-op-docs SOURCE_DIR --write\\|--check")
run(2 out ${WORK} --verify)
message(STATUS "tapegrad-op-docs: check, the three faults, write and usage as documented")
