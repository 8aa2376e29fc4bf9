-- hostile: the same link, opened for appending
-- setup: mkdir lesson-output
-- setup: symlink lesson-output/notes.txt ../../outside/sentinel
-- expect: 'notes.txt' is a symbolic link
lab.lesson{title = "hostile", claims = {"h1"}}
io.open("notes.txt", "a"):write("appended\n")
