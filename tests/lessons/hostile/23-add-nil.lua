-- hostile: a method called through pcall with a nil argument once named no function ('?')
-- expect: bad argument #2 to 'engine.add' (table expected, got nil)
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny"}
local ok, message = pcall(e.add, e, nil)
error(message, 0)
