-- wrk script for bench/router_overhead.py: every request POSTs the same completion body and the
-- run ends with one machine-readable line, "RESULT {...}", that the driver parses.
-- Environment: BENCH_MODEL (served model name), BENCH_MAX_TOKENS (16), BENCH_PROMPT_WORDS (64),
-- BENCH_STREAM ("true").
local model = os.getenv("BENCH_MODEL") or "tiny"
local max_tokens = tonumber(os.getenv("BENCH_MAX_TOKENS") or "16")
local n_words = tonumber(os.getenv("BENCH_PROMPT_WORDS") or "64")
local stream = os.getenv("BENCH_STREAM") or "true"

local words = {}
for i = 1, n_words do
  words[#words + 1] = "word" .. i
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"' .. model .. '","prompt":"' .. table.concat(words, " ") ..
  '","max_tokens":' .. max_tokens .. ',"stream":' .. stream .. '}'

-- No response() callback: it would run Lua per response on the client's core. wrk already
-- counts statuses above 399 in summary.errors.status.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write("RESULT {")
  io.write(string.format('"requests":%d,"duration_us":%d,"bytes":%d,', summary.requests,
    summary.duration, summary.bytes))
  io.write(string.format('"status_errors":%d,"connect_errors":%d,"read_errors":%d,', e.status,
    e.connect, e.read))
  io.write(string.format('"write_errors":%d,"timeouts":%d,', e.write, e.timeout))
  io.write(string.format('"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f',
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
  io.write("}\n")
end
