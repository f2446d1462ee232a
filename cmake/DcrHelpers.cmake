# Helper functions shared by every directory of dcr.

# Common warning and sanitizer flags for a dcr target.
function(dcr_target_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>)
  if(DCR_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(DCR_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${DCR_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${DCR_SANITIZE})
  endif()
endfunction()

# dcr_add_test(NAME SOURCES ... LIBS ... [LABELS quick|slow|gpu ...])
# Builds one GoogleTest binary and registers every test case with CTest under the labels.
function(dcr_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_LABELS)
    set(T_LABELS quick)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  dcr_target_flags(${name})
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()

# dcr_add_area_tests(AREA_DIR LIBS ...): every *_test.cc in AREA_DIR becomes one binary
# dcr_<area>_tests (label quick); every *_slow_test.cc one binary dcr_<area>_slow_tests (label slow).
function(dcr_add_area_tests dir)
  cmake_parse_arguments(A "" "" "LIBS" ${ARGN})
  get_filename_component(area ${dir} NAME)
  file(GLOB quick CONFIGURE_DEPENDS ${dir}/*_test.cc)
  file(GLOB slow CONFIGURE_DEPENDS ${dir}/*_slow_test.cc)
  if(slow)
    list(REMOVE_ITEM quick ${slow})
  endif()
  if(quick)
    dcr_add_test(dcr_${area}_tests SOURCES ${quick} LIBS ${A_LIBS} LABELS quick)
  endif()
  if(slow)
    dcr_add_test(dcr_${area}_slow_tests SOURCES ${slow} LIBS ${A_LIBS} LABELS slow TIMEOUT 1800)
  endif()
endfunction()
