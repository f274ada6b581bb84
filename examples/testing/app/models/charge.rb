# frozen_string_literal: true

# One charge of an order: the effect that must happen once per order.
class Charge < ActiveRecord::Base
end

# One refund: written in the claim's own transaction.
class Refund < ActiveRecord::Base
end
