-- Replays pre-signed requests with wrk, so the load generator does no crypto.
--
-- Usage: wrk -t T -c C -d D -s replay.lua URL -- FILE T [cycle]
-- FILE has one request per line: METHOD <TAB> PATH <TAB> HEADERS <TAB> BODY, where HEADERS is
-- "name: value" pairs joined by "|" and BODY may be empty. Each line is sent at most once
-- (thread k of T takes lines k, k+T, k+2T, ...). When a thread runs out it sends GET /healthz and
-- counts it in "exhausted", so the runner can tell that the file was too small and retry. With
-- "cycle" it starts the file over instead (for a server that checks nothing, the HTTP floor).
-- done() prints one line "BENCH_JSON {...}" with counts per status and latency percentiles, and
-- "quantiles": the latency at the middle of each 1% of requests up to the 99th percentile and of
-- each 0.01% above it (199 values), so the runner can merge the distributions of several runs.

local threads = {}
local created = 0

function setup(thread)
  thread:set("id", created)
  created = created + 1
  table.insert(threads, thread)
end

function init(args)
  local file = args[1]
  local nthreads = tonumber(args[2]) or 1
  cycle = args[3] == "cycle"
  fallback = wrk.format("GET", "/healthz")
  requests = {}
  local line_number = 0
  for line in io.lines(file) do
    if line_number % nthreads == id then
      local method, path, headers, body = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
      local h = {}
      for pair in headers:gmatch("[^|]+") do
        local name, value = pair:match("^([^:]+):%s*(.*)$")
        h[name] = value
      end
      if body == "" then
        body = nil
      end
      requests[#requests + 1] = wrk.format(method, path, h, body)
    end
    line_number = line_number + 1
  end
  loaded = #requests
  index = 0
  exhausted = 0
  statuses = {}
end

function request()
  index = index + 1
  if cycle and index > loaded then
    index = 1
  end
  local r = requests[index]
  if r == nil then
    exhausted = exhausted + 1
    return fallback
  end
  return r
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local by_status = {}
  local total_exhausted = 0
  local total_loaded = 0
  local total_sent = 0
  for _, thread in ipairs(threads) do
    local s = thread:get("statuses")
    for code, n in pairs(s) do
      by_status[code] = (by_status[code] or 0) + n
    end
    total_exhausted = total_exhausted + thread:get("exhausted")
    total_loaded = total_loaded + thread:get("loaded")
    total_sent = total_sent + thread:get("index")
  end
  local parts = {}
  for code, n in pairs(by_status) do
    parts[#parts + 1] = string.format('"%d":%d', code, n)
  end
  local quantiles = {}
  for k = 0, 98 do
    quantiles[#quantiles + 1] = string.format("%d", latency:percentile(k + 0.5))
  end
  for k = 0, 99 do
    quantiles[#quantiles + 1] = string.format("%d", latency:percentile(99 + (k + 0.5) / 100))
  end
  local errors = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"statuses":{%s},"exhausted":%d,"loaded":%d,"sent":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d},"quantiles":[%s]}\n',
    summary.requests, summary.duration, summary.bytes, table.concat(parts, ","), total_exhausted, total_loaded,
    total_sent, errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency.mean, latency.max, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), table.concat(quantiles, ",")))
end
