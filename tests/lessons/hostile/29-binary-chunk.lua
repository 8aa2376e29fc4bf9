-- hostile: loading hand-made bytecode
-- expect: attempt to load a binary chunk
lab.lesson{title = "hostile", claims = {"h1"}}
local chunk, message = load("\27Lua\84\0")
error(message, 0)
