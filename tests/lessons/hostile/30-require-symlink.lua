-- hostile: require of a module that is a link to a file outside the lesson's folder
-- setup: symlink evil.lua ../outside/sentinel
-- expect: 'evil.lua' is a symbolic link
lab.lesson{title = "hostile", claims = {"h1"}}
require("evil")
