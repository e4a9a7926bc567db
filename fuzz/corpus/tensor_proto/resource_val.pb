r*
%/job:ps/replica:0/task:0/device:CPU:0v