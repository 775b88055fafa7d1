# A Rails-like origin for tests: a Rack app behind Rack::MethodOverride (the first middleware
# of every Rails app), served by WEBrick. Every request is answered `method=METHOD path=PATH`
# with the method the app ran, and appended to LOG the same way.
#
#   ruby rack_origin.rb LOG     # prints the port, then serves until killed
require "rack"
require "rack/method_override"
require "rack/handler/webrick"
require "webrick"

log = ARGV.fetch(0)
app = lambda do |env|
  line = "method=#{env['REQUEST_METHOD']} path=#{env['PATH_INFO']}"
  File.open(log, "a") { |f| f.puts(line) }
  [200, { "Content-Type" => "text/plain" }, ["#{line}\n"]]
end
server = WEBrick::HTTPServer.new(
  BindAddress: "127.0.0.1", Port: 0,
  Logger: WEBrick::Log.new(File::NULL), AccessLog: []
)
server.mount("/", Rack::Handler::WEBrick, Rack::MethodOverride.new(app))
puts server.listeners[0].addr[1]
$stdout.flush
server.start
