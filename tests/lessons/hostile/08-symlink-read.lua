-- hostile: a link in the lesson's folder to a file outside it
-- setup: symlink secret.txt ../outside/sentinel
-- expect: 'secret.txt' is a symbolic link
lab.lesson{title = "hostile", claims = {"h1"}}
print(io.open("secret.txt"):read("a"))
