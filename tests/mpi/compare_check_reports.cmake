# CTest script: tapegrad-check in one process and under `mpirun -np 2` must print the same report
# (the seconds taken aside) and exit alike. Run as
#   cmake -DMPIEXEC=... -DTOOL=... -DARGS="..." -P compare_check_reports.cmake
separate_arguments(args UNIX_COMMAND "${ARGS}")
foreach(np 1 2)
  execute_process(COMMAND ${MPIEXEC} --oversubscribe -np ${np} ${TOOL} ${args} --quiet
                  OUTPUT_VARIABLE report${np} ERROR_VARIABLE errors${np} RESULT_VARIABLE status${np})
  string(REGEX REPLACE "; [0-9.]+ s\n" "\n" report${np} "${report${np}}")
  message(STATUS "np ${np} (exit ${status${np}}):\n${report${np}}${errors${np}}")
endforeach()
if(NOT report1 MATCHES "^gradcheck ")
  message(FATAL_ERROR "no report from one process")
endif()
if(NOT report1 STREQUAL report2 OR NOT status1 EQUAL status2)
  message(FATAL_ERROR "the reports differ between one process and mpirun -np 2")
endif()
