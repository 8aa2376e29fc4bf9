-- hostile: the output folder itself is a link to another folder
-- setup: symlink lesson-output ../outside
-- expect: is a symbolic link; lessons write only into a real folder
lab.lesson{title = "hostile", claims = {"h1"}}
io.open("planted.txt", "w"):write("x")
