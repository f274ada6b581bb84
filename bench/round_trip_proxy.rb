# frozen_string_literal: true

require "socket"

module IdempotentJobBench
  # A TCP proxy in front of PostgreSQL that counts round trips, independent of any
  # timing: a round trip is a client→server flight that follows a server→client one
  # (however many packets or protocol messages each flight holds). Pipelined
  # messages sent before any answer count once, as they cost one wait. Used only to
  # count; nothing is timed through it.
  class RoundTripProxy
    # @param host [String] PostgreSQL's host
    # @param port [Integer] PostgreSQL's port
    def initialize(host, port)
      @upstream = [host, port]
      @server = TCPServer.new("127.0.0.1", 0)
      @peers = {}
      @round_trips = 0
      @lock = Mutex.new
    end

    # @return [Integer] the port the proxy listens on (127.0.0.1)
    def port
      @server.addr[1]
    end

    # Starts forwarding in a background thread.
    # @return [self]
    def start
      @thread = Thread.new { pump_forever }
      @thread.report_on_exception = false
      self
    end

    # @return [Integer] round trips seen so far, over every proxied connection
    def round_trips
      @lock.synchronize { @round_trips }
    end

    # Stops the proxy and closes every connection through it.
    # @return [void]
    def stop
      @thread&.kill
      @thread&.join
      (@peers.keys + [@server]).each { |io| io.close unless io.closed? }
    end

    private

    def pump_forever
      loop do
        readable, = IO.select([@server, *@peers.keys])
        readable.each { |io| io.equal?(@server) ? accept : forward(io) }
      end
    end

    def accept
      client = @server.accept
      upstream = TCPSocket.new(*@upstream)
      [client, upstream].each { |s| s.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) }
      flight = { last: :server }
      @peers[client] = [upstream, :client, flight]
      @peers[upstream] = [client, :server, flight]
    end

    def forward(io)
      # Hung up earlier in this round of select (both ends of a pair were readable, and
      # the first one's hang-up closed the second): nothing to forward.
      return unless @peers.key?(io)

      peer, side, flight = @peers.fetch(io)
      data = io.read_nonblock(65_536, exception: false)
      return if data == :wait_readable
      return hang_up(io, peer) if data.nil?

      @lock.synchronize { @round_trips += 1 } if side == :client && flight[:last] == :server
      flight[:last] = side
      peer.write(data)
    rescue IOError, SystemCallError
      hang_up(io, peer)
    end

    def hang_up(io, peer)
      [io, peer].each do |s|
        @peers.delete(s)
        s.close unless s.closed?
      end
    end
  end
end
