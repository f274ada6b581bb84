# frozen_string_literal: true

require "io/wait"
require "json"
require "socket"

module Soak
  # The stand-in for an outside system (a payment provider, a mail service): a process
  # of its own, apart from the workers, that counts effect calls per reference and keeps
  # a log of each call (reference, worker id, fencing token, attempt, jid, time of
  # receipt). A SIGKILLed worker cannot take its calls back: what reached the stand-in
  # is counted.
  #
  # Protocol: one line per request over TCP on 127.0.0.1, one line per answer.
  #   EFFECT <json>   → "OK <count for that reference>"
  #   COUNT <ref>     → "<count>"
  #   DUMP            → one JSON line per call, in order of receipt, then "END"
  #   PING            → "PONG"
  class StandIn
    # Raised by the client when the stand-in cannot be reached or answers badly.
    class Error < StandardError; end

    # @param log_path [String] file that receives one JSON line per effect call (appended)
    def initialize(log_path)
      @log = File.open(log_path, "a")
      @log.sync = true
      @calls = []
      @counts = Hash.new(0)
      @lock = Mutex.new
    end

    # Listens on 127.0.0.1 and serves until the process ends, a thread per connection.
    # @param port [Integer] 0 for any free port
    # @yieldparam port [Integer] the port listened on, once listening
    # @return [void]
    def serve(port = 0)
      server = TCPServer.new("127.0.0.1", port)
      yield server.addr[1] if block_given?
      loop do
        client = server.accept
        Thread.new(client) { |connection| converse(connection) }
      end
    end

    # Answers one request line.
    # @param line [String]
    # @return [String] the answer, without the newline
    def answer(line)
      verb, argument = line.chomp.split(" ", 2)
      case verb
      when "EFFECT" then "OK #{effect(JSON.parse(argument.to_s))}"
      when "COUNT" then @lock.synchronize { @counts[argument.to_s] }.to_s
      when "DUMP" then [*@lock.synchronize { @calls.map { |call| JSON.generate(call) } }, "END"].join("\n")
      when "PING" then "PONG"
      else "ERROR unknown request #{verb.inspect}"
      end
    rescue JSON::ParserError => e
      "ERROR #{e.message}"
    end

    private

    def converse(connection)
      while (line = connection.gets)
        connection.write("#{answer(line)}\n")
      end
    rescue IOError, SystemCallError
      nil # the caller died (a SIGKILLed worker): what it sent was counted
    ensure
      connection.close
    end

    # @return [Integer] calls for the reference so far, this one included
    def effect(call)
      reference = call.fetch("reference")
      @lock.synchronize do
        entry = call.merge("at" => Time.now.to_f)
        @log.puts(JSON.generate(entry))
        @calls << entry
        @counts[reference] += 1
      end
    end

    # A connection to the stand-in for one request (a new connection per call, so a
    # worker thread holds nothing between calls).
    class Client
      # Seconds to connect and to wait for an answer.
      TIMEOUT = 5

      # @return [Client] for SOAK_STAND_IN ("host:port")
      def self.from_env
        new(ENV.fetch("SOAK_STAND_IN"))
      end

      # @param address [String] "host:port"
      def initialize(address)
        @host, port = address.split(":")
        @port = Integer(port)
      end

      # Makes the outside effect for a reference.
      # @param reference [String] the operation's reference ("<job type>/<operation key>")
      # @param worker [String] the calling worker's id
      # @param token [String, nil] the fencing token of the claim that runs the body
      # @param attempt [Integer, nil] the claim's attempt
      # @param jid [String] the delivering job's id
      # @return [Integer] calls for the reference so far, this one included
      # @raise [Error] when the stand-in is unreachable or answers badly
      def effect(reference:, worker:, token:, attempt:, jid:)
        answer = request("EFFECT #{JSON.generate({ reference:, worker:, token:, attempt:, jid: })}")
        raise Error, "stand-in refused the effect: #{answer}" unless answer.start_with?("OK ")

        Integer(answer.split.last)
      end

      # @param reference [String]
      # @return [Integer] effect calls received for the reference
      def count(reference)
        Integer(request("COUNT #{reference}"))
      end

      # @return [Array<Hash>] every effect call received ("reference", "worker", "token",
      #   "attempt", "jid", "at" (Float, epoch seconds)), in order of receipt
      def calls
        socket = connect
        socket.write("DUMP\n")
        calls = []
        while (line = socket.gets&.chomp) != "END"
          raise Error, "the stand-in closed the connection during DUMP" if line.nil?

          calls << JSON.parse(line)
        end
        calls
      ensure
        socket&.close
      end

      # @return [Boolean] whether the stand-in answers
      def alive?
        request("PING") == "PONG"
      rescue Error
        false
      end

      private

      def connect
        Socket.tcp(@host, @port, connect_timeout: TIMEOUT)
      rescue SystemCallError, SocketError, IOError => e
        raise Error, "stand-in at #{@host}:#{@port} unreachable: #{e.class}: #{e.message}"
      end

      def request(line)
        socket = connect
        socket.write("#{line}\n")
        raise Error, "stand-in at #{@host}:#{@port} did not answer within #{TIMEOUT} s" unless
          socket.wait_readable(TIMEOUT)

        socket.gets&.chomp or raise Error, "stand-in at #{@host}:#{@port} closed the connection"
      rescue SystemCallError, IOError => e
        raise Error, "stand-in at #{@host}:#{@port}: #{e.class}: #{e.message}"
      ensure
        socket&.close
      end
    end
  end
end

# `ruby soak/stand_in.rb PORT_FILE LOG_FILE`: serves on a free port, written to PORT_FILE.
if $PROGRAM_NAME == __FILE__
  port_file, log_file = ARGV
  abort "usage: ruby #{$PROGRAM_NAME} PORT_FILE LOG_FILE" unless port_file && log_file
  Soak::StandIn.new(log_file).serve do |port|
    File.write("#{port_file}.tmp", port.to_s)
    File.rename("#{port_file}.tmp", port_file)
  end
end
