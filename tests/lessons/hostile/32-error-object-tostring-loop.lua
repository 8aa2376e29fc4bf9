-- hostile: an error object whose __tostring loops (the host must not call it)
-- expect: error object is a table, not a message
lab.lesson{title = "hostile", claims = {"h1"}}
error(setmetatable({}, {__tostring = function() while true do end end}))
