-- hostile: e:close() inside e:run's stop_when (the engine was freed under e:run)
-- expect: engine closed during stop_when
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny", kv_mem = "2MiB"}
e:add{prompt = "Once", max_tokens = 8}
e:run{stop_when = function() e:close() end}
