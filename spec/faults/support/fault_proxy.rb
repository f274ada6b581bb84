# frozen_string_literal: true

require "socket"

# A TCP proxy in front of PostgreSQL (real sockets, one thread per direction) that
# can break the network the way a failover or a partition does:
# * {#reset!} closes every proxied connection with a TCP reset (both sides see it);
# * {#blackhole!} stops forwarding in both directions while keeping every socket open,
#   and leaves new connections unanswered (a partition: nothing arrives, nothing fails);
# * {#restore!} forwards again (what was held is delivered, as after a partition heals).
class FaultProxy
  # @return [Integer] the port the proxy listens on (127.0.0.1)
  attr_reader :port

  # @param target_port [Integer] where PostgreSQL listens on 127.0.0.1
  def initialize(target_port)
    @target_port = target_port
    @server = TCPServer.new("127.0.0.1", 0)
    @port = @server.addr[1]
    @lock = Mutex.new
    @open = ConditionVariable.new
    @blackhole = false
    @sockets = []
    @accepted = 0
    @acceptor = Thread.new { accept_loop }
  end

  # @return [Integer] connections accepted so far
  def accepted
    @lock.synchronize { @accepted }
  end

  # Closes every proxied connection with a reset (SO_LINGER 0).
  # @return [Integer] sockets reset
  def reset!
    sockets = @lock.synchronize { @sockets.dup.tap { @sockets.clear } }
    sockets.each { |s| abort_socket(s) }
    sockets.size
  end

  # Stops forwarding in both directions; sockets stay open.
  # @return [void]
  def blackhole!
    @lock.synchronize { @blackhole = true }
  end

  # Forwards again.
  # @return [void]
  def restore!
    @lock.synchronize do
      @blackhole = false
      @open.broadcast
    end
  end

  # Stops listening and closes everything.
  # @return [void]
  def stop
    @acceptor.kill
    @server.close
    reset!
    restore!
  end

  private

  def accept_loop
    loop do
      client = @server.accept
      @lock.synchronize do
        @accepted += 1
        @sockets << client
      end
      Thread.new(client) { |c| connect_and_pipe(c) }
    end
  rescue IOError, Errno::EBADF
    nil
  end

  def connect_and_pipe(client)
    wait_open
    upstream = TCPSocket.new("127.0.0.1", @target_port)
    @lock.synchronize { @sockets << upstream }
    [Thread.new { pipe(client, upstream) }, Thread.new { pipe(upstream, client) }]
  rescue SystemCallError, IOError
    abort_socket(client)
  end

  def wait_open
    @lock.synchronize { @open.wait(@lock) while @blackhole }
  end

  # Copies `from` to `to` until either closes; holds what it read while blackholed.
  def pipe(from, to)
    loop do
      wait_open
      data = from.readpartial(65_536)
      wait_open
      to.write(data)
    end
  rescue SystemCallError, IOError
    abort_socket(from)
    abort_socket(to)
  end

  def abort_socket(socket)
    socket.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
    socket.close
  rescue SystemCallError, IOError
    nil
  end
end
