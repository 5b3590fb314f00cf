# lumos_find_python(<result> [REQUIRED]): finds a Python interpreter with its development
# headers and pybind11 (CONFIG, as Debian's pybind11-dev installs it); sets <result> to ON when
# all are there. With REQUIRED, a missing piece is a configure error that names it.
#
# Which interpreter: Python_EXECUTABLE when given; else the first of `python3` on PATH and
# /usr/bin/python3 that can import numpy. Debian's python3-numpy / python3-pytest install for
# /usr/bin/python3, while a pyenv or virtualenv python3 earlier on PATH may lack them; the module
# must be built for the interpreter that will import it.
include_guard(GLOBAL)

function(lumos_find_python result)
  set(required ${ARGN})
  if(NOT Python_EXECUTABLE)
    find_program(lumos_path_python3 NAMES python3)
    foreach(candidate IN ITEMS "${lumos_path_python3}" /usr/bin/python3)
      if(candidate AND EXISTS "${candidate}")
        execute_process(COMMAND "${candidate}" -c "import numpy" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
        if(rc EQUAL 0)
          set(Python_EXECUTABLE "${candidate}" CACHE FILEPATH "Python interpreter of the lumos module")
          break()
        endif()
      endif()
    endforeach()
  endif()
  if(NOT TARGET Python::Module)
    find_package(Python 3.8 COMPONENTS Interpreter Development.Module ${required} QUIET)
  endif()
  if(TARGET Python::Module AND NOT TARGET pybind11::module)
    set(PYBIND11_FINDPYTHON ON)  # reuse the Python found above (FindPython), not FindPythonLibsNew
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(TARGET pybind11::module AND TARGET Python::Module)
    set(${result} ON PARENT_SCOPE)
    get_property(reported GLOBAL PROPERTY lumos_python_reported)
    set_property(GLOBAL PROPERTY lumos_python_reported ON)
    if(NOT reported)
      message(STATUS "lumos Python package: ${Python_EXECUTABLE} (Python ${Python_VERSION}), pybind11 ${pybind11_VERSION}")
    endif()
  else()
    set(${result} OFF PARENT_SCOPE)
    if(required)
      message(FATAL_ERROR "LUMOS_BUILD_PYTHON=ON needs a Python 3 with headers and pybind11 "
                          "(Debian: apt-get install python3-dev pybind11-dev python3-numpy)")
    endif()
    message(STATUS "lumos Python package: not built (needs pybind11-dev, python3-dev and python3-numpy)")
  endif()
endfunction()
