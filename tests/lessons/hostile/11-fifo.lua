-- hostile: opening a FIFO once blocked the host forever
-- setup: fifo data.fifo
-- expect: 'data.fifo' is not a regular file
lab.lesson{title = "hostile", claims = {"h1"}}
io.open("data.fifo"):read("a")
