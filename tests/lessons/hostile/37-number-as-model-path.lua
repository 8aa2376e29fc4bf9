-- hostile: a number where a model path goes; fuzzing found the host kept a pointer to a dead stack buffer (AddressSanitizer: stack-use-after-scope)
-- expect: field 'model': '0' is neither a preset
lab.lesson{title = "hostile", claims = {"h1"}}
lab.engine{model = 0}
