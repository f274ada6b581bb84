# frozen_string_literal: true

# A real Rack server for the browser spec: Sidekiq Web (with the Idempotency tab) at
# /sidekiq and the standalone page at /idempotency, behind a cookie session, in WEBrick.
# Run as its own process: ruby spec/support/web_server.rb PORT_FILE (DATABASE_URL,
# REDIS_URL); it listens on a free port of loopback and writes the port to PORT_FILE.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "securerandom"
require "logger"
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "sidekiq/web"
require "rack"
require "rack/session/cookie"
require "webrick"
# Rack 3 moved the server handlers to the rackup gem (Rackup::Handler); Rack 2 has Rack::Handler.
begin
  require "rackup"
rescue LoadError
  nil
end
handler = defined?(Rackup::Handler::WEBrick) ? Rackup::Handler::WEBrick : Rack::Handler::WEBrick
require "idempotent_job/web"

Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"), logger: Logger.new(File::NULL))
secret = SecureRandom.hex(32)
app = Rack::Builder.new do
  use Rack::Session::Cookie, secret:, same_site: true, key: "web_server.session"
  map("/sidekiq") { run Sidekiq::Web }
  map("/idempotency") { run IdempotentJob::Web }
end
port_file = ARGV.fetch(0)
handler.run(app, Host: "127.0.0.1", Port: 0, AccessLog: [],
                 Logger: WEBrick::Log.new(File::NULL)) do |server|
  File.write("#{port_file}.tmp", server.listeners.first.addr[1].to_s)
  File.rename("#{port_file}.tmp", port_file)
end
