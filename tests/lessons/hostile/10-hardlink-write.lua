-- hostile: a hard link shipped in the output folder shares its data with a file outside
-- setup: mkdir lesson-output
-- setup: hardlink lesson-output/h.txt ../outside/sentinel
-- expect: 'h.txt' has other hard links
lab.lesson{title = "hostile", claims = {"h1"}}
io.open("h.txt", "w"):write("overwritten")
