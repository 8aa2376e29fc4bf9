-- hostile: a dangling link shipped in the output folder once led a write outside it
-- setup: mkdir lesson-output
-- setup: symlink lesson-output/notes.txt ../../outside/authorized_keys
-- expect: 'notes.txt' is a symbolic link, and lessons never follow links
lab.lesson{title = "hostile", claims = {"h1"}}
local f = io.open("notes.txt", "w")
f:write("ssh-ed25519 AAAA attacker\n")
f:close()
